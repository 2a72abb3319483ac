"""The worker tests that run again on another broker or state store.

A module that star-imports this one (``from tests.e2e.worker_suite import *``)
gets pytest to collect the worker tests of test_workers.py and the kill -9 /
cancel tests of test_default_pool.py again, in that module, with its own
module settings (``E2E_BROKER = "amqp"`` in test_workers_amqp.py,
``E2E_STATE = "cluster"`` in test_workers_cluster.py; see tests/e2e/conftest.py).
"""

from __future__ import annotations

from tests.e2e.test_default_pool import (
    test_cancel_stops_a_member_working_on_the_default_pool,
    test_kill9_of_a_worker_with_many_calls_in_flight_recovers_them_all,
)
from tests.e2e.test_workers import (
    corpus,
    test_a_example_team_completes_on_one_worker_process_consuming_every_queue,
    test_b_two_workers_on_one_member_queue_overlap_that_members_work_items,
    test_c_kill9_while_a_member_works_recovers_after_the_lease,
    test_d_duplicated_doorbell_and_redelivered_messages_execute_once,
    test_e_cancel_with_no_worker_online_then_the_work_never_runs,
    test_f_a_pickled_task_message_is_refused_and_nothing_runs,
)

__all__ = [
    "corpus",
    "test_a_example_team_completes_on_one_worker_process_consuming_every_queue",
    "test_b_two_workers_on_one_member_queue_overlap_that_members_work_items",
    "test_c_kill9_while_a_member_works_recovers_after_the_lease",
    "test_cancel_stops_a_member_working_on_the_default_pool",
    "test_d_duplicated_doorbell_and_redelivered_messages_execute_once",
    "test_e_cancel_with_no_worker_online_then_the_work_never_runs",
    "test_f_a_pickled_task_message_is_refused_and_nothing_runs",
    "test_kill9_of_a_worker_with_many_calls_in_flight_recovers_them_all",
]
