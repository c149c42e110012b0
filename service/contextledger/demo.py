"""``contextledger demo``: a scripted agent session, narrated step by step.

No model is called: the "agent" is a script, so the demo runs offline and the
same every time. What it shows is the ledger's behaviour, which is real.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.panel import Panel

from .session import Ledger, Session

SYSTEM = "You are a careful coding agent. Use tools to inspect files before editing."


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


TURNS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi, I'm Ada. Our service listens on port 8443; please find "
                                 "why the health check fails."}],
    [{"role": "assistant", "content": None,
      "tool_calls": [_call("call_1", "read_file", path="service/health.py")]},
     {"role": "tool", "tool_call_id": "call_1", "name": "read_file",
      "content": "def health():\n    return check_port(8080)  # TODO: config\n"}],
    [{"role": "assistant", "content": "health.py checks port 8080, but you said the service "
                                      "listens on 8443. That mismatch fails the check."}],
    [{"role": "user", "content": "Good catch. Decision: read the port from config, never "
                                 "hard-code it."}],
]
RISKY: list[dict[str, Any]] = [
    {"role": "assistant", "content": None,
     "tool_calls": [_call("call_2", "run_shell", cmd="rm -rf build/ && make deploy")]},
    {"role": "tool", "tool_call_id": "call_2", "name": "run_shell",
     "content": "error: deploy target refused: tests failing"},
    {"role": "assistant", "content": "The deploy failed; I went too far."},
]
AFTER: list[dict[str, Any]] = [
    {"role": "assistant", "content": None,
     "tool_calls": [_call("call_3", "edit_file", path="service/health.py",
                          patch="- check_port(8080)\n+ check_port(config.port)")]},
    {"role": "tool", "tool_call_id": "call_3", "name": "edit_file", "content": "ok: 1 line"},
    {"role": "assistant", "content": "health.py now reads the port from config (8443)."},
    {"role": "user", "content": "Thanks! Now add a test for it."},
]


async def _append_all(session: Session, console: Console, messages: list[dict[str, Any]]) -> None:
    from .cli import _short

    for m in messages:
        seq = await session.add_message(m)
        console.print(f"  [dim]seq {seq:>3}[/dim]  [cyan]{m['role']:<9}[/cyan] {_short(m, 60)}")


async def run_demo(ledger: Ledger, console: Console) -> Session:
    from .cli import view_table

    sid = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(Panel.fit(f"contextledger demo · store: {ledger!r}\nsession: {sid}",
                            title="contextledger"))
    session = await ledger.session(sid, model="gpt-4o", metadata={"demo": True})

    console.rule("1. record an agent session (messages, tool calls, tool results)")
    await _append_all(session, console, [{"role": "system", "content": SYSTEM}])
    for turn in TURNS:
        await _append_all(session, console, turn)

    console.rule("2. checkpoint before a risky step")
    cp = await session.checkpoint("before-deploy")
    console.print(f"  checkpoint [bold]{cp.label}[/bold] at seq {cp.seq}")
    await _append_all(session, console, RISKY)

    console.rule("3. roll back: the risky turns leave the view, not the ledger")
    await session.rollback("before-deploy")
    console.print(view_table("view after rollback", await session.view()))
    await _append_all(session, console, AFTER)

    console.rule("4. a rolling summary replaces early turns in the view")
    items = await session.view_items()
    first, last = items[1].seq, items[5].seq  # up to the user's decision: no tool pair split
    summary = ("Summary of earlier turns: user Ada: service listens on port 8443; health check "
               "failed because health.py checked 8080. Decision: read the port from config.")
    seq = await session.record_summary(first, last, summary, audit={"by": "demo script"})
    console.print(f"  summary event seq {seq} replaces view items with seq {first}..{last}")
    console.print(view_table("working view (what the next request sees)", await session.view()))
    history = await session.get_messages()
    console.print(f"  get_messages() still returns all {len(history)} messages of the branch")

    console.rule("5. replay: the exact view the model saw at an earlier seq")
    console.print(view_table(f"view_at({cp.seq + 2})", await session.view_at(cp.seq + 2)))

    console.rule("6. verify the hash chain and rebuild the projection")
    report = await session.verify()
    events = [e async for e in session.events()]
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e.type] = kinds.get(e.type, 0) + 1
    console.print(f"  {len(events)} events: " + ", ".join(f"{k} x{v}" for k, v in kinds.items()))
    status = "[green]intact[/green]" if report.ok else f"[red]BROKEN at {report.first_bad_seq}"
    console.print(f"  hash chain {status}; head hash {events[-1].hash[:16]}…")
    [rebuilt] = await ledger.rebuild(sid)
    console.print(f"  rebuild from events: {'identical' if rebuilt.ok else rebuilt.differences}")
    console.print(f"\nTry: contextledger events {sid}   ·   contextledger view {sid} --at {cp.seq}")
    return session
