"""The ``contextledger`` command: replay, verify, roll back — and the demo.

``--dsn`` (before or after the command) / ``CONTEXTLEDGER_DSN`` choose the server;
without either, the embedded PostgreSQL under ``CONTEXTLEDGER_HOME`` is used (and
migrated). Every listing takes ``--json``. Errors print as ``[CODE] message`` and
exit with status 2; a failed verification exits with 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from contextledger.extras import DISTRIBUTION, require_extra

require_extra("cli", "click", "rich")

import click  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from contextledger.core.chain import Anchor  # noqa: E402
from contextledger.errors import (  # noqa: E402
    ContextLedgerError,
    IntegrityFailure,
    LedgerCredentialsRejected,
    StoreError,
)
from contextledger.ledger import Ledger  # noqa: E402
from contextledger.render import fitted_table, short, view_table  # noqa: E402

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
console = Console()
err_console = Console(stderr=True)
#: ``-h`` works wherever ``--help`` does.
CONTEXT = {"help_option_names": ["-h", "--help"]}


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON-able: {type(value).__name__}")


def _echo_json(value: Any, *, indent: int | None = 2) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=indent, default=_json_default))


def _remember(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--dsn``/``--home``/``--tenant`` after the command name: same meaning as before it."""
    if value is not None and param.name is not None:
        ctx.ensure_object(dict)[param.name] = value
    return value


def target_options(fn: F) -> F:
    """Let a subcommand take ``--dsn``, ``--home`` and ``--tenant`` too, so every command
    takes them in the same places (``contextledger anchor ID --dsn …``)."""
    fn = click.option(
        "--tenant",
        default=None,
        expose_value=False,
        callback=_remember,
        help="Act as this service tenant (row-level security applies).",
    )(fn)
    fn = click.option(
        "--home",
        default=None,
        expose_value=False,
        callback=_remember,
        help="Where the embedded PostgreSQL keeps its data.",
    )(fn)
    return click.option(
        "--dsn",
        default=None,
        expose_value=False,
        callback=_remember,
        help="postgresql://… or memory:// (default: $CONTEXTLEDGER_DSN, else embedded).",
    )(fn)


def _no_tenant(ctx: click.Context, why: str) -> None:
    """Commands that act as the database's administrator, not as a tenant."""
    if ctx.obj.get("tenant"):
        raise click.UsageError(f"--tenant does not apply to `{ctx.info_name}`: {why}")


def _print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    keep: Collection[str] = (),
    full: bool = False,
) -> None:
    """Print a ``fitted_table`` as wide as the terminal (the listings but ``erasures``)."""
    console.print(fitted_table(title, columns, rows, width=console.width, keep=keep, full=full))


def _full_option(fn: F) -> F:
    return click.option("--full", is_flag=True, help="Show whole ids and hashes.")(fn)


def _json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")(fn)


#: What the operator does next, by group of the error tree (``errors.py``).
_NEXT: tuple[tuple[type[ContextLedgerError], str], ...] = (
    (LedgerCredentialsRejected, "fix the user or password (--dsn / $CONTEXTLEDGER_DSN)"),
    (StoreError, "the database could not serve the command"),
    (IntegrityFailure, "what is stored does not check out: `contextledger verify` says where"),
)


def _report(exc: ContextLedgerError) -> None:
    """``[CODE] message`` and, by group, what to do next; the operator runs the CLI, so
    unlike the service's problem bodies it says everything (passwords stay redacted)."""
    text = str(exc).replace("the DSN came from the dsn argument", "the DSN came from --dsn")
    err_console.print(f"[red]{escape(text)}[/red]")
    for group, advice in _NEXT:
        if isinstance(exc, group):
            retry = " (retryable: try again shortly)" if exc.is_retryable else ""
            err_console.print(f"[dim]{escape(advice)}{retry}[/dim]")
            break


def _run(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except ContextLedgerError as exc:
            _report(exc)
            sys.exit(2)

    return wrapper


def _open(ctx: click.Context, *, migrate: bool | None = None) -> Any:
    obj = ctx.obj
    tenant = obj.get("tenant")
    role = "contextledger_service" if tenant else None  # under RLS, as the service is
    return Ledger.open(
        obj.get("dsn"), home=obj.get("home"), migrate=migrate, tenant=tenant, role=role
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


@click.group(context_settings=CONTEXT)
@click.version_option(_version(), "--version", "-V", prog_name="contextledger")
@click.option(
    "--dsn",
    default=None,
    help="postgresql://… or memory:// (default: $CONTEXTLEDGER_DSN, else the embedded server).",
)
@click.option(
    "--home",
    envvar="CONTEXTLEDGER_HOME",
    default=None,
    help="Where the embedded PostgreSQL keeps its data.",
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default=None,
    help="Log rendering (default: console in a terminal, JSON otherwise).",
)
@click.option(
    "--tenant",
    envvar="CONTEXTLEDGER_TENANT",
    default=None,
    help="Act as this service tenant (row-level security applies; session ids are per tenant).",
)
@click.pass_context
def main(
    ctx: click.Context,
    dsn: str | None,
    home: str | None,
    log_format: str | None,
    tenant: str | None,
) -> None:
    """contextledger: an agent's memory as an append-only ledger in PostgreSQL.

    Options --dsn and --home go before or after the command.
    """
    from contextledger.log_setup import configure_logging

    configure_logging(log_format, level="WARNING")  # type: ignore[arg-type]
    ctx.obj = {"dsn": dsn, "home": home, "tenant": tenant, "log_format": log_format}


@main.command(context_settings=CONTEXT)
@target_options
@click.pass_context
@_run
async def demo(ctx: click.Context) -> None:
    """A scripted agent session: record, checkpoint, roll back, summarize, replay, verify."""
    from contextledger.demo import run_demo

    async with _open(ctx) as ledger:
        await run_demo(ledger, console)


@main.command(context_settings=CONTEXT)
@target_options
@click.pass_context
@_run
async def migrate(ctx: click.Context) -> None:
    """Apply the schema migrations to the chosen server."""
    _no_tenant(ctx, "migrations run as the database's administrator (the DSN's user)")
    from contextledger.store import migrate as migrations

    async with _open(ctx, migrate=True) as ledger:
        console.print(f"[green]migrated[/green] {ledger!r} to {migrations.head_revision()}")


@main.command(context_settings=CONTEXT)
@target_options
@_json_option
@_full_option
@click.pass_context
@_run
async def sessions(ctx: click.Context, as_json: bool, full: bool) -> None:
    """List sessions (purged ones: `contextledger purges`)."""
    async with _open(ctx) as ledger:
        found = await ledger.sessions()
    if as_json:
        _echo_json(
            [
                {
                    "session_id": s.session_id,
                    "created_at": s.created_at,
                    "model": s.model,
                    "events": s.head,
                    "view_tokens": s.view_tokens,
                    "view_items": s.view_count,
                    "metadata": dict(s.metadata),
                }
                for s in found
            ]
        )
        return
    rows = [
        (
            s.session_id,
            s.created_at.isoformat(timespec="seconds"),
            s.model or "-",
            str(s.head),
            str(s.view_tokens),
            str(s.view_count),
        )
        for s in found
    ]
    _print_table(
        "sessions",
        ("session", "created", "model", "events", "view tokens", "view items"),
        rows,
        keep=("events", "view tokens", "view items"),
        full=full,
    )


def _role(data: dict[str, Any]) -> str:
    message = data.get("message")
    return str(message.get("role", "")) if isinstance(message, dict) else ""


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@click.option("--from", "from_seq", type=int, default=1, help="First seq.")
@click.option("--to", "to_seq", type=int, default=None, help="Last seq.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_full_option
@click.pass_context
@_run
async def events(
    ctx: click.Context,
    session_id: str,
    from_seq: int,
    to_seq: int | None,
    as_json: bool,
    full: bool,
) -> None:
    """Print a session's events: seq, type, role, tokens, time, detail, hash."""
    async with _open(ctx) as ledger:
        session = await ledger.session(session_id, create=False)
        if as_json:
            async for e in session.events(from_seq, to_seq):
                click.echo(json.dumps(e.to_dict(), ensure_ascii=False))
            return
        rows = []
        async for e in session.events(from_seq, to_seq):
            data = e.payload.to_data()
            detail = (
                short(data["message"], 10_000)
                if "message" in data
                else json.dumps(
                    {k: v for k, v in data.items() if k not in ("messages", "audit", "original")}
                )
            )
            rows.append(
                (
                    str(e.seq),
                    e.type,
                    _role(data),
                    str(e.tokens),
                    e.created_at.isoformat(timespec="seconds"),
                    detail,
                    e.hash if full else e.hash[:12],
                )
            )
        _print_table(
            f"events of {session_id}",
            ("seq", "type", "role", "tokens", "at", "detail", "hash"),
            rows,
            keep=("seq", "role", "tokens"),
            full=full,
        )


@main.command("export", context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write to this file (default: standard output).",
)
@click.pass_context
@_run
async def export_cmd(ctx: click.Context, session_id: str, output: str | None) -> None:
    """Write a session's events as JSON lines, with their hashes (for `import`)."""
    from contextledger.transfer import export_lines

    async with _open(ctx) as ledger:
        if output is None:
            async for line in export_lines(ledger, session_id):
                click.echo(line)
            return
        lines = [line + "\n" async for line in export_lines(ledger, session_id)]
        await asyncio.to_thread(Path(output).write_text, "".join(lines), encoding="utf-8")
        count = len(lines)
        err_console.print(f"exported {count} events of {session_id} to {output}")


@main.command("import", context_settings=CONTEXT)
@target_options
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.option("--session", "session_id", default=None, help="Import under this id instead.")
@click.pass_context
@_run
async def import_cmd(ctx: click.Context, file: Any, session_id: str | None) -> None:
    """Check an export (every hash) and, only if it is whole, write it as a new session."""
    from contextledger.transfer import import_events, parse_export

    # the whole file is checked before anything is written
    events = await asyncio.to_thread(parse_export, file)
    async with _open(ctx) as ledger:
        result = await import_events(ledger, events, session_id=session_id)
        report = await ledger.verify(result.session_id)
    console.print(
        f"[green]imported[/green] {result.events} events of {result.source_session_id} "
        f"as {result.session_id}; chain {'ok' if report.ok else 'BAD'}"
    )
    if not report.ok:
        sys.exit(1)


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@click.option("--at", "at_seq", type=int, default=None, help="Replay the view as of this seq.")
@_json_option
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
            console.print(view_table(title, messages, width=console.width))


@main.command(context_settings=CONTEXT)
@target_options
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


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@_json_option
@click.pass_context
@_run
async def checkpoints(ctx: click.Context, session_id: str, as_json: bool) -> None:
    """List a session's checkpoints (the targets `rollback` takes)."""
    async with _open(ctx) as ledger:
        session = await ledger.session(session_id, create=False)
        found = await session.checkpoints()
    if as_json:
        _echo_json([{"seq": c.seq, "label": c.label, "created_at": c.created_at} for c in found])
        return
    rows = [(str(c.seq), c.label or "-", c.created_at.isoformat(timespec="seconds")) for c in found]
    _print_table(
        f"checkpoints of {session_id}",
        ("seq", "label", "at"),
        rows,
        keep=("seq",),
    )


@main.command(context_settings=CONTEXT)
@target_options
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
        console.print(view_table("view now", await session.view(), width=console.width))


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("source")
@click.argument("new")
@click.option(
    "--at", "at", default=None, help="A checkpoint label or a seq to fork at (default: the head)."
)
@_json_option
@click.pass_context
@_run
async def fork(ctx: click.Context, source: str, new: str, at: str | None, as_json: bool) -> None:
    """Fork SOURCE into a new session NEW (copy-on-write: nothing is copied)."""
    async with _open(ctx) as ledger:
        target: int | str | None = int(at) if at is not None and at.isdigit() else at
        session = await ledger.fork(source, new, at=target)
        parent = session.parent
    if as_json:
        _echo_json({"session_id": new, "head": session.head, "parent": parent})
        return
    assert parent is not None
    console.print(
        f"forked {escape(new)} from {escape(parent[0])} at seq {parent[1]} (head {session.head})"
    )


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Verify every session.")
@click.option("--anchor", "anchor", default=None, help="SEQ:HASH the chain must still reach.")
@_json_option
@click.pass_context
@_run
async def verify(
    ctx: click.Context, session_id: str | None, all_: bool, anchor: str | None, as_json: bool
) -> None:
    """Walk the hash chain; exit 1 at the first bad event (or a missed --anchor)."""
    if bool(session_id) == all_:
        raise click.UsageError("give a SESSION_ID or --all")
    if anchor is not None and all_:
        raise click.UsageError("--anchor needs one SESSION_ID")
    pin = Anchor.parse(anchor) if anchor is not None else None
    async with _open(ctx) as ledger:
        reports = (
            await ledger.verify_all()
            if all_
            else [await ledger.verify(session_id or "", anchor=pin)]
        )
    bad = [r for r in reports if not r.ok]
    if as_json:
        _echo_json([dataclasses.asdict(r) for r in reports])
    for r in [] if as_json else reports:
        if r.ok:
            console.print(f"[green]ok[/green]  {r.session_id}: {r.events} events")
        else:
            console.print(f"[red]BAD[/red] {r.session_id}: seq {r.first_bad_seq}: {r.reason}")
    if bad:
        sys.exit(1)


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id", required=False)
@click.option("--force", is_flag=True, help="Rebuild even from a chain that does not verify.")
@click.pass_context
@_run
async def rebuild(ctx: click.Context, session_id: str | None, force: bool) -> None:
    """Recompute the view rows from the events and repair any difference.

    Refuses (exit 2) when a chain does not verify, unless --force.
    """
    async with _open(ctx) as ledger:
        for r in await ledger.rebuild(session_id, force=force):
            if r.ok:
                console.print(f"[green]ok[/green]  {r.session_id}")
            else:
                console.print(
                    f"[yellow]repaired[/yellow] {r.session_id}: " + "; ".join(r.differences)
                )


@main.command(context_settings=CONTEXT)
@target_options
@_json_option
@_full_option
@click.pass_context
@_run
async def purges(ctx: click.Context, as_json: bool, full: bool) -> None:
    """List purged sessions: what was removed, by whom, when and why."""
    async with _open(ctx) as ledger:
        records = await ledger.store.purges()
    if as_json:
        _echo_json(records)
        return
    rows = [
        (
            r["session_id"],
            r["purged_at"].isoformat(timespec="seconds"),
            r["purged_by"],
            str(r["events"]),
            r["reason"],
            (r["last_hash"] or "-") if full else (r["last_hash"] or "-")[:12],
        )
        for r in records
    ]
    _print_table(
        "purged sessions",
        ("session", "purged at", "by", "events", "reason", "last hash"),
        rows,
        keep=("events",),
        full=full,
    )


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@click.option("--reason", required=True, help="Recorded in contextledger.purges.")
@click.confirmation_option(prompt="Purging deletes the session's events for good. Continue?")
@click.pass_context
@_run
async def purge(ctx: click.Context, session_id: str, reason: str) -> None:
    """The one audited way to remove a session from the ledger."""
    async with _open(ctx) as ledger:
        n = await ledger.store.purge(session_id, reason)
        console.print(f"purged {session_id}: {n} events (audited)")


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@click.option("--reason", required=True, help="Recorded in the erasure's audit record.")
@click.option("--actor", default=None, help="On whose behalf (a ticket, a person): recorded.")
@click.confirmation_option(
    prompt="Erasing destroys the session's data key: its content is unreadable for good. Continue?"
)
@click.pass_context
@_run
async def erase(ctx: click.Context, session_id: str, reason: str, actor: str | None) -> None:
    """Erase a sealed session by destroying its data key (and its forks with it).

    Its derived copies (view rows, search postings, embeddings) go too; its chain still
    verifies; `contextledger erasures` lists who erased what, when and why. A session
    written without a key-encryption key cannot be erased: `purge` it.
    """
    async with _open(ctx) as ledger:
        for r in await ledger.erase(session_id, reason=reason, actor=actor):
            removed = ", ".join(f"{n} {kind}" for kind, n in r.removed.items())
            console.print(f"erased {escape(r.session_id)}: {r.events} events sealed for good")
            console.print(f"  derived rows removed: {removed} (audited)")


@main.command(context_settings=CONTEXT)
@target_options
@_json_option
@_full_option
@click.pass_context
@_run
async def erasures(ctx: click.Context, as_json: bool, full: bool) -> None:
    """List erased sessions: who erased which, on whose behalf, when and why."""
    async with _open(ctx) as ledger:
        records = await ledger.erasures()
    if as_json:
        _echo_json([r.to_dict() for r in records])
        return
    table = Table(title="erased sessions", title_justify="left")
    for col in ("session", "erased at", "by", "actor", "events", "reason", "last hash"):
        table.add_column(col, overflow="fold" if full else "ellipsis")
    for r in records:
        table.add_row(
            escape(r.session_id),
            r.erased_at.isoformat(timespec="seconds"),
            escape(r.erased_by),
            escape(r.actor or "-"),
            str(r.events),
            escape(r.reason),
            r.last_hash if full else r.last_hash[:12],
        )
    console.print(table)


@main.group()
def retention() -> None:
    """Erase or purge idle sessions by policy (off unless a policy is given)."""


def _policy(tenant: str | None, erase_after: int | None, purge_after: int | None) -> Any:
    """The options, else this tenant's entry in ``$CONTEXTLEDGER_RETENTION`` (the JSON
    object ``tenant -> policy`` the service reads too; the embedded ledger is ``local``)."""
    import os

    from contextledger.retention import ENV, RetentionPolicy, policies_from_json

    if erase_after is not None or purge_after is not None:
        return RetentionPolicy(erase_after, purge_after)
    policies = policies_from_json(os.environ.get(ENV, ""))
    name = tenant or "local"
    if name not in policies:
        raise click.UsageError(
            f"give --erase-after-days and/or --purge-after-days, or a policy for tenant "
            f"{name!r} in ${ENV}"
        )
    return policies[name]


@retention.command("apply", context_settings=CONTEXT)
@target_options
@click.option(
    "--erase-after-days", type=int, default=None, help="Erase sealed sessions idle N days."
)
@click.option("--purge-after-days", type=int, default=None, help="Purge sessions idle N days.")
@click.option("--dry-run", is_flag=True, help="List what would go; change nothing.")
@_json_option
@click.pass_context
@_run
async def retention_apply(
    ctx: click.Context,
    erase_after_days: int | None,
    purge_after_days: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Apply a retention policy: each erasure and purge audited like a manual one.

    Idle = days since a session's last event. --tenant applies it to that tenant only.
    """
    from contextledger import retention as policy_rules

    policy = _policy(ctx.obj.get("tenant"), erase_after_days, purge_after_days)
    async with _open(ctx) as ledger:
        actions = await policy_rules.apply(ledger, policy, dry_run=dry_run)
    if as_json:
        _echo_json(
            {
                "dry_run": dry_run,
                "policy": policy.to_dict(),
                "actions": [a.to_dict() for a in actions],
            }
        )
        return
    title = "retention: would do (dry run)" if dry_run else "retention: done"
    table = Table(title=title, title_justify="left")
    for col in ("session", "action", "idle days", "last activity", "why"):
        table.add_column(col)
    for a in actions:
        table.add_row(
            escape(a.session_id),
            a.action,
            f"{a.idle_days:.1f}",
            a.last_activity.isoformat(timespec="seconds"),
            escape(a.why),
        )
    console.print(table)
    console.print(f"{len(actions)} session(s)" + (" (nothing changed)" if dry_run else ""))


@main.group()
def kek() -> None:
    """The key-encryption key that wraps sessions' data keys ($CONTEXTLEDGER_KEK)."""


@kek.command("generate", context_settings=CONTEXT)
def kek_generate() -> None:
    """Print a new random KEK (32 bytes, standard base64) for your secret store."""
    import base64
    import os

    click.echo(base64.b64encode(os.urandom(32)).decode())


@kek.command("rotate", context_settings=CONTEXT)
@target_options
@click.pass_context
@_run
async def kek_rotate(ctx: click.Context) -> None:
    """Re-wrap every data key under the current KEK.

    Set $CONTEXTLEDGER_KEK to the new KEK and $CONTEXTLEDGER_KEK_OLD to the old one(s);
    once this reports 0 left, drop the old KEK from $CONTEXTLEDGER_KEK_OLD.
    """
    async with _open(ctx) as ledger:
        rotate: Callable[[], Awaitable[int]] | None = getattr(ledger.store, "rotate_keys", None)
        if rotate is None:
            raise click.UsageError("key rotation needs a PostgreSQL store")
        n = await rotate()
        console.print(f"re-wrapped {n} data keys under the current KEK")


@main.group(context_settings=CONTEXT)
def keys() -> None:
    """API keys of the service: each belongs to a tenant; the first one ends local mode."""


async def _admin(ctx: click.Context) -> Any:
    """A connection as the administrator (the DSN's user), on a migrated database."""
    import asyncpg

    _no_tenant(ctx, "keys are managed as the database's administrator (the DSN's user)")
    from contextledger.store.dsn import asyncpg_dsn

    async with _open(ctx, migrate=True) as ledger:
        if ledger.dsn is None or ledger.dsn == "memory://":
            raise click.UsageError("keys need a PostgreSQL store")
        return await asyncpg.connect(asyncpg_dsn(ledger.dsn))


@keys.command("create", context_settings=CONTEXT)
@target_options
@click.argument("key_tenant", metavar="TENANT")  # not ``tenant``: --tenant is the option
@click.option("--name", default="", help="A note saying whose key this is.")
@click.pass_context
@_run
async def keys_create(ctx: click.Context, key_tenant: str, name: str) -> None:
    """Create a key for TENANT; it is printed once and stored only as a hash."""
    from contextledger.http.keys import create_key

    conn = await _admin(ctx)
    try:
        key_id, key = await create_key(conn, key_tenant, name)
    finally:
        await conn.close()
    err_console.print(f"created key {key_id} for tenant {key_tenant} (shown once):")
    click.echo(key)


@keys.command("list", context_settings=CONTEXT)
@target_options
@click.pass_context
@_run
async def keys_list(ctx: click.Context) -> None:
    """List keys (ids, tenants, names, dates; never the keys)."""
    from contextledger.http.keys import list_keys

    conn = await _admin(ctx)
    try:
        found = await list_keys(conn)
    finally:
        await conn.close()
    rows = [
        (
            k.key_id,
            k.tenant,
            k.name,
            k.created_at.strftime("%Y-%m-%d %H:%M"),
            k.revoked_at.strftime("%Y-%m-%d %H:%M") if k.revoked_at else "",
        )
        for k in found
    ]
    _print_table(
        "API keys",
        ("key id", "tenant", "name", "created", "revoked"),
        rows,
        keep=("key id",),
    )


@keys.command("revoke", context_settings=CONTEXT)
@target_options
@click.argument("key_id")
@click.pass_context
@_run
async def keys_revoke(ctx: click.Context, key_id: str) -> None:
    """Revoke a key by id (the service notices within its key cache time, 5 s)."""
    from contextledger.http.keys import revoke_key

    conn = await _admin(ctx)
    try:
        done = await revoke_key(conn, key_id)
    finally:
        await conn.close()
    if not done:
        err_console.print(f"[red]no active key {escape(key_id)}[/red]")
        sys.exit(2)
    console.print(f"revoked {key_id}")


#: Settings that are not ``serve`` flags: the target comes from ``--dsn``/``--home``, the
#: logging from ``--log-format`` (before or after the command).
_NOT_FLAGS = frozenset({"dsn", "home", "log_format"})


def _settings_flags(fn: F) -> F:
    """A flag per service setting: ``--model-map '{"gpt-4o": "…"}'``, ``--fallbacks a,b``,
    ``--pass-client-key`` … each parsed exactly as its ``CONTEXTLEDGER_<NAME>``, with the
    help the setting carries (``Settings``)."""
    from dataclasses import MISSING, fields

    from contextledger.http.settings import ENV_PREFIX, Settings

    for f in reversed(fields(Settings)):
        if f.name in _NOT_FLAGS:
            continue
        env = ENV_PREFIX + f.name.upper()
        help_text = f.metadata.get("help", "")
        if f.default not in (MISSING, None, ()):
            help_text += f" Default: {f.default}."
        flag = f.name.replace("_", "-")
        decls = [f"--{flag}/--no-{flag}" if str(f.type) == "bool" else f"--{flag}", f.name]
        meta = None if str(f.type) == "bool" else "VALUE"
        fn = click.option(*decls, default=None, metavar=meta, help=f"{help_text} [env: {env}]")(fn)
    return fn


@main.command(context_settings=CONTEXT)
@target_options
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default=None,
    help="Log rendering (default: console in a terminal, JSON otherwise).",
)
@_settings_flags
@click.pass_context
def serve(ctx: click.Context, /, log_format: str | None, **flags: str | bool | None) -> None:
    """Run the HTTP service: REST API, OpenAI-compatible proxy, audit page, /metrics.

    Every setting is a flag or a ``CONTEXTLEDGER_*`` variable (the flag wins)."""
    try:
        from contextledger.http.server import run as run_server
        from contextledger.http.settings import Settings, parse_setting
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise click.UsageError(
            f"the service needs the 'service' extra: pip install '{DISTRIBUTION}[service]' ({exc})"
        ) from None
    from contextledger.log_setup import configure_logging

    obj = ctx.obj
    _no_tenant(ctx, "the service's tenants come from API keys (contextledger keys create)")
    try:
        given: dict[str, Any] = {
            k: parse_setting(k, v) if isinstance(v, str) else v
            for k, v in flags.items()
            if v is not None
        }
        log_format = log_format or obj.get("log_format")
        settings = Settings.from_env(
            dsn=obj["dsn"], home=obj["home"], log_format=log_format, **given
        )
        configure_logging(settings.log_format, level="INFO")  # type: ignore[arg-type]
        run_server(settings)
    except ContextLedgerError as exc:
        _report(exc)
        sys.exit(2)


@main.command(context_settings=CONTEXT)
@target_options
@click.argument("session_id")
@click.pass_context
@_run
async def anchor(ctx: click.Context, session_id: str) -> None:
    """Print the session's current {seq, hash} as JSON: keep it outside the database and
    check it later with ``verify ID --anchor SEQ:HASH``."""
    async with _open(ctx) as ledger:
        pin = await ledger.anchor(session_id)
    click.echo(
        json.dumps({"session_id": session_id, "seq": pin.seq, "hash": pin.hash, "anchor": str(pin)})
    )


if __name__ == "__main__":  # pragma: no cover
    main()
