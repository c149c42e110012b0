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

from contextledger.ledger import Ledger
from contextledger.render import short, view_table
from contextledger.session import Session

SYSTEM = "You are a careful coding agent. Use tools to inspect files before editing."


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


#: The file the agent reads: a tool result of realistic size, the bulk a summary folds.
HEALTH_PY = "\n".join(
    [
        '"""Health checks for the deploy pipeline."""',
        "import socket",
        "import time",
        "",
        "RETRIES = 3",
        "TIMEOUT_S = 2.0",
        "",
        "",
        "def check_port(port: int, host: str = '127.0.0.1') -> bool:",
        "    for attempt in range(RETRIES):",
        "        try:",
        "            with socket.create_connection((host, port), timeout=TIMEOUT_S):",
        "                return True",
        "        except OSError:",
        "            time.sleep(0.5 * (attempt + 1))",
        "    return False",
        "",
        "",
        "def check_disk(path: str = '/var/lib/app', minimum_free: float = 0.1) -> bool:",
        "    import shutil",
        "    usage = shutil.disk_usage(path)",
        "    return usage.free / usage.total >= minimum_free",
        "",
        "",
        "def health() -> dict[str, bool]:",
        "    return {",
        "        'port': check_port(8080),  # TODO: read the port from config",
        "        'disk': check_disk(),",
        "    }",
    ]
)

TURNS: list[list[dict[str, Any]]] = [
    [
        {
            "role": "user",
            "content": "Hi, I'm Ada. Our service listens on port 8443; please find "
            "why the health check fails.",
        }
    ],
    [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("call_1", "read_file", path="service/health.py")],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "read_file",
            "content": HEALTH_PY,
        },
    ],
    [
        {
            "role": "assistant",
            "content": "health.py checks port 8080, but you said the service "
            "listens on 8443. That mismatch fails the check.",
        }
    ],
    [
        {
            "role": "user",
            "content": "Good catch. Decision: read the port from config, never hard-code it.",
        }
    ],
]
RISKY: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("call_2", "run_shell", cmd="rm -rf build/ && make deploy")],
    },
    {
        "role": "tool",
        "tool_call_id": "call_2",
        "name": "run_shell",
        "content": "error: deploy target refused: tests failing",
    },
    {"role": "assistant", "content": "The deploy failed; I went too far."},
]
AFTER: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _call(
                "call_3",
                "edit_file",
                path="service/health.py",
                patch="- check_port(8080)\n+ check_port(config.port)",
            )
        ],
    },
    {"role": "tool", "tool_call_id": "call_3", "name": "edit_file", "content": "ok: 1 line"},
    {"role": "assistant", "content": "health.py now reads the port from config (8443)."},
    {"role": "user", "content": "Thanks! Now add a test for it."},
]


async def _append_all(session: Session, console: Console, messages: list[dict[str, Any]]) -> None:
    for m in messages:
        seq = await session.add_message(m)
        console.print(f"  [dim]seq {seq:>3}[/dim]  [cyan]{m['role']:<9}[/cyan] {short(m, 60)}")


async def run_demo(ledger: Ledger, console: Console) -> Session:
    sid = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(
        Panel.fit(f"contextledger demo · store: {ledger!r}\nsession: {sid}", title="contextledger")
    )
    session = await ledger.session(
        sid,
        model="gpt-4o",
        metadata={"demo": True},
        config={"summarizer": {"preserve_recent_turns": 2, "min_messages": 3}},
    )

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

    console.rule("4. budgets: how full is the session, and what would a small model get?")
    u = await session.usage()
    console.print(
        f"  {u.tokens} tokens counted at append ({session.counter.name}); budget "
        f"{u.budget} for gpt-4o → {u.fraction:.2%}, state [bold]{u.state}[/bold]"
    )
    # a budget smaller than the view, so the request view really has to leave turns out
    budget = u.tokens // 2
    small = await session.get_messages_for_request(token_budget=budget)
    view = await session.view()
    carried = session.counter.count_messages(small)
    console.print(
        view_table(
            f"request view for a {budget}-token budget (half the view; ephemeral: nothing written)",
            small,
        )
    )
    console.print(
        f"  the view holds {len(view)} messages ({u.tokens} tokens); this request carries "
        f"{len(small)} ({carried} tokens): the oldest turns left out, the system prompt "
        "and the latest turns kept, every tool call with its result"
    )

    console.rule("5. a rolling summary replaces early turns in the view, not in the ledger")
    before = (await session.usage()).tokens
    saved = await session.compact("summarize")
    summary_event = [e async for e in session.events()][-1]
    audit = summary_event.payload.to_data()["audit"]
    after = (await session.usage()).tokens
    console.print(
        f"  summary.recorded at seq {summary_event.seq} by [bold]{audit['model']}"
        f"[/bold] (no model configured: the offline summarizer) covers positions "
        f"{audit['covered'][0]}..{audit['covered'][1]}: the view went from {before} to "
        f"{after} tokens (saved {saved})"
    )
    console.print(view_table("working view (what the next request sees)", await session.view()))
    history = await session.get_messages()
    console.print(f"  get_messages() still returns all {len(history)} messages of the branch")

    console.rule("6. replay: the exact view the model saw at an earlier seq")
    console.print(view_table(f"view_at({cp.seq + 2})", await session.view_at(cp.seq + 2)))

    console.rule("7. verify the hash chain and rebuild the projection")
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
