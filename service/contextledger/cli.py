"""The ``contextledger`` command: replay, verify, roll back — and the demo.

``--dsn`` / ``CONTEXTLEDGER_DSN`` choose the server; without either, the
embedded PostgreSQL under ``CONTEXTLEDGER_HOME`` is used (and migrated).
Errors print as ``[CODE] message`` and exit with status 2; a failed
verification exits with 1.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import ContextLedgerError
from .session import Ledger

T = TypeVar("T")
console = Console()
err_console = Console(stderr=True)


def _run(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except ContextLedgerError as exc:
            err_console.print(f"[red]{exc}[/red]")
            sys.exit(2)

    return wrapper


def _open(ctx: click.Context, *, migrate: bool | None = None) -> Any:
    obj = ctx.obj
    return Ledger.open(obj["dsn"], home=obj["home"], migrate=migrate)


def _short(message: Any, width: int = 70) -> str:
    content = message.get("content")
    if content is None and message.get("tool_calls"):
        names = [c.get("function", {}).get("name", "?") for c in message["tool_calls"]]
        text = f"→ calls {', '.join(names)}"
    elif isinstance(content, list):
        parts = []
        for block in content:
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                parts.append(f"→ {block.get('name')}({json.dumps(block.get('input'))})")
            elif kind == "tool_result":
                parts.append(f"← {block.get('content')!s}")
            else:
                parts.append(f"[{kind}]")
        text = " ".join(parts)
    else:
        text = str(content)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def view_table(title: str, messages: list[dict[str, Any]]) -> Table:
    table = Table(title=title, show_lines=False, title_justify="left")
    table.add_column("#", justify="right", style="dim")
    table.add_column("role", style="cyan")
    table.add_column("content")
    for i, m in enumerate(messages, 1):
        table.add_row(str(i), str(m.get("role")), escape(_short(m)))
    return table


@click.group()
@click.option("--dsn", envvar="CONTEXTLEDGER_DSN", default=None,
              help="postgresql://… or memory:// (default: the embedded PostgreSQL).")
@click.option("--home", envvar="CONTEXTLEDGER_HOME", default=None,
              help="Where the embedded PostgreSQL keeps its data.")
@click.option("--log-format", type=click.Choice(["console", "json"]), default=None,
              help="Log rendering (default: console in a terminal, JSON otherwise).")
@click.pass_context
def main(ctx: click.Context, dsn: str | None, home: str | None, log_format: str | None) -> None:
    """contextledger: an agent's memory as an append-only ledger in PostgreSQL."""
    from .logging import configure_logging

    configure_logging(log_format, level="WARNING")  # type: ignore[arg-type]
    ctx.obj = {"dsn": dsn, "home": home}


@main.command()
@click.pass_context
@_run
async def demo(ctx: click.Context) -> None:
    """A scripted agent session: record, checkpoint, roll back, summarize, replay, verify."""
    from .demo import run_demo

    async with _open(ctx) as ledger:
        await run_demo(ledger, console)


@main.command()
@click.pass_context
@_run
async def migrate(ctx: click.Context) -> None:
    """Apply the schema migrations to the chosen server."""
    from .ledger import migrate as migrations

    async with _open(ctx, migrate=True) as ledger:
        console.print(f"[green]migrated[/green] {ledger!r} to {migrations.head_revision()}")


@main.command()
@click.pass_context
@_run
async def sessions(ctx: click.Context) -> None:
    """List sessions."""
    async with _open(ctx) as ledger:
        table = Table(title="sessions", title_justify="left")
        for col in ("session", "created", "model", "events", "view tokens", "view items"):
            table.add_column(col)
        for s in await ledger.sessions():
            table.add_row(s.session_id, s.created_at.isoformat(timespec="seconds"),
                          s.model or "-", str(s.head), str(s.view_tokens), str(s.view_count))
        console.print(table)


@main.command()
@click.argument("session_id")
@click.option("--from", "from_seq", type=int, default=1)
@click.option("--to", "to_seq", type=int, default=None)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@_run
async def events(ctx: click.Context, session_id: str, from_seq: int, to_seq: int | None,
                 as_json: bool) -> None:
    """Print a session's events."""
    async with _open(ctx) as ledger:
        session = await ledger.session(session_id, create=False)
        if as_json:
            async for e in session.events(from_seq, to_seq):
                click.echo(json.dumps(e.to_dict(), ensure_ascii=False))
            return
        table = Table(title=f"events of {session_id}", title_justify="left")
        for col in ("seq", "type", "tokens", "at", "detail", "hash"):
            table.add_column(col)
        async for e in session.events(from_seq, to_seq):
            data = e.payload.to_data()
            detail = _short(data["message"]) if "message" in data else json.dumps(
                {k: v for k, v in data.items() if k not in ("messages", "audit")})[:70]
            table.add_row(str(e.seq), e.type, str(e.tokens),
                          e.created_at.isoformat(timespec="seconds"), detail, e.hash[:12])
        console.print(table)


@main.command()
@click.argument("session_id")
@click.option("--at", "at_seq", type=int, default=None, help="Replay the view as of this seq.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_run
async def view(ctx: click.Context, session_id: str, at_seq: int | None, as_json: bool) -> None:
    """Show the working view now, or replayed as of --at SEQ."""
    async with _open(ctx) as ledger:
        session = await ledger.session(session_id, create=False)
        messages = await (session.view_at(at_seq) if at_seq is not None else session.view())
        if as_json:
            click.echo(json.dumps(messages, ensure_ascii=False, indent=2))
        else:
            title = f"view of {session_id}" + (f" at seq {at_seq}" if at_seq is not None else "")
            console.print(view_table(title, messages))


@main.command()
@click.argument("session_id")
@click.argument("label", required=False)
@click.pass_context
@_run
async def checkpoint(ctx: click.Context, session_id: str, label: str | None) -> None:
    """Record a checkpoint."""
    async with _open(ctx) as ledger:
        session = await ledger.session(session_id, create=False)
        cp = await session.checkpoint(label)
        console.print(f"checkpoint [bold]{cp.label or '-'}[/bold] at seq {cp.seq}")


@main.command()
@click.argument("session_id")
@click.argument("target")
@click.pass_context
@_run
async def rollback(ctx: click.Context, session_id: str, target: str) -> None:
    """Roll the view back to a checkpoint label or a seq (history is kept)."""
    async with _open(ctx) as ledger:
        session = await ledger.session(session_id, create=False)
        to: int | str = int(target) if target.isdigit() else target
        seq = await session.rollback(to)
        console.print(f"rolled back to {target} (event seq {seq})")
        console.print(view_table("view now", await session.view()))


@main.command()
@click.argument("session_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Verify every session.")
@click.pass_context
@_run
async def verify(ctx: click.Context, session_id: str | None, all_: bool) -> None:
    """Walk the hash chain; exit 1 at the first bad event."""
    if bool(session_id) == all_:
        raise click.UsageError("give a SESSION_ID or --all")
    async with _open(ctx) as ledger:
        reports = await ledger.verify_all() if all_ else [await ledger.verify(session_id or "")]
    bad = [r for r in reports if not r.ok]
    for r in reports:
        if r.ok:
            console.print(f"[green]ok[/green]  {r.session_id}: {r.events} events")
        else:
            console.print(f"[red]BAD[/red] {r.session_id}: seq {r.first_bad_seq}: {r.reason}")
    if bad:
        sys.exit(1)


@main.command()
@click.argument("session_id", required=False)
@click.pass_context
@_run
async def rebuild(ctx: click.Context, session_id: str | None) -> None:
    """Recompute the view rows from the events and repair any difference."""
    async with _open(ctx) as ledger:
        for r in await ledger.rebuild(session_id):
            if r.ok:
                console.print(f"[green]ok[/green]  {r.session_id}")
            else:
                console.print(f"[yellow]repaired[/yellow] {r.session_id}: "
                              + "; ".join(r.differences))


@main.command()
@click.argument("session_id")
@click.option("--reason", required=True, help="Recorded in contextledger.purges.")
@click.confirmation_option(prompt="Purging deletes the session's events for good. Continue?")
@click.pass_context
@_run
async def purge(ctx: click.Context, session_id: str, reason: str) -> None:
    """The one audited way to remove a session from the ledger."""
    async with _open(ctx) as ledger:
        purge_fn: Callable[[str, str], Awaitable[int]] | None = getattr(
            ledger.store, "purge", None)
        if purge_fn is None:
            raise click.UsageError("purge needs a PostgreSQL store")
        n = await purge_fn(session_id, reason)
        console.print(f"purged {session_id}: {n} events (audited)")


if __name__ == "__main__":  # pragma: no cover
    main()
