"""What every step of a distributed run shares: the per-loop worker context,
the Redis keys the worker owns, the batched run writer and its events, usage,
work-item links and completion, the tool journal, lease renewal, replay after
a crash, tracing across segments, and the sending of the next step."""
