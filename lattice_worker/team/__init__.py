"""Teams in one process: supervisor delegation (``agent_tool``) and mailbox
teams (``create_team``, ``team_member``, the runner, ``drain``).

Guide: docs/tutorial.md; design: docs/architecture.md, "Teams in one process". The distributed runtime
reuses :func:`~lattice_worker.team.work.run_work_item`,
:func:`~lattice_worker.team.lead_tools.make_lead_member_tools` and
:func:`~lattice_worker.team.reports.format_report_message`.
"""

from .agent_tool import agent_tool, delegate_tool
from .depth import DEFAULT_MAX_DELEGATE_DEPTH
from .drain import DrainResult, drain_team
from .events import AgentMessageEvent, AgentRuntimeFailure, TeamAgentEvent, TeamMessageEvent
from .ids import lead_mailbox_id, mailbox_id, new_work_item_id
from .lead_tools import Dispatcher, handoff_receipt, make_lead_member_tools
from .mailbox_state import MailboxToolState
from .member import TeamMember, team_member
from .member_tools import MAILBOX_TOOL_NAMES, make_mailbox_tools
from .reports import TeamResultMessage, failed_work_items, format_report_message, parse_report_message
from .runner import RunnerOptions, TeamRunner, create_team_runner
from .team import Team, create_team
from .work import WorkItemOutcome, run_work_item

__all__ = [
    "DEFAULT_MAX_DELEGATE_DEPTH",
    "AgentMessageEvent",
    "AgentRuntimeFailure",
    "Dispatcher",
    "DrainResult",
    "MAILBOX_TOOL_NAMES",
    "MailboxToolState",
    "RunnerOptions",
    "Team",
    "TeamAgentEvent",
    "TeamMember",
    "TeamMessageEvent",
    "TeamResultMessage",
    "TeamRunner",
    "WorkItemOutcome",
    "agent_tool",
    "create_team",
    "create_team_runner",
    "delegate_tool",
    "drain_team",
    "failed_work_items",
    "format_report_message",
    "handoff_receipt",
    "lead_mailbox_id",
    "mailbox_id",
    "make_lead_member_tools",
    "make_mailbox_tools",
    "new_work_item_id",
    "parse_report_message",
    "run_work_item",
    "team_member",
]
