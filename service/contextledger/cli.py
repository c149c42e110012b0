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
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from contextledger.extras import require_extra

require_extra("cli", "click", "rich")

import click  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from contextledger.core.chain import Anchor  # noqa: E402
from contextledger.errors import ContextLedgerError  # noqa: E402
from contextledger.ledger import Ledger  # noqa: E402
from contextledger.render import short, view_table  # noqa: E402

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
    """``--dsn``/``--home`` after the command name: same meaning as before it."""
    if value is not None and param.name is not None:
        ctx.ensure_object(dict)[param.name] = value
    return value


def target_options(fn: F) -> F:
    """Let a subcommand take ``--dsn`` and ``--home`` too (``contextledger migrate --dsn …``)."""
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


def _full_option(fn: F) -> F:
    return click.option("--full", is_flag=True, help="Show whole ids and hashes.")(fn)


def _json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")(fn)


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
    tenant = obj.get("tenant")
    role = "contextledger_service" if tenant else None  # under RLS, as the service is
    return Ledger.open(
        obj.get("dsn"), home=obj.get("home"), migrate=migrate, tenant=tenant, role=role
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("contextledger")
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
    table = Table(title="sessions", title_justify="left")
    for col in ("session", "created", "model", "events", "view tokens", "view items"):
        table.add_column(col, overflow="fold" if full else "ellipsis", no_wrap=not full)
    for s in found:
        table.add_row(
            escape(s.session_id),
            s.created_at.isoformat(timespec="seconds"),
            escape(s.model or "-"),
            str(s.head),
            str(s.view_tokens),
            str(s.view_count),
        )
    console.print(table)


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
        table = Table(title=f"events of {session_id}", title_justify="left")
        for col in ("seq", "type", "role", "tokens", "at", "detail", "hash"):
            table.add_column(
                col,
                overflow="fold" if full else "ellipsis",
                no_wrap=col in ("seq", "hash") or not full,
            )
        width = 10_000 if full else 70
        async for e in session.events(from_seq, to_seq):
            data = e.payload.to_data()
            detail = (
                short(data["message"], width)
                if "message" in data
                else json.dumps(
                    {k: v for k, v in data.items() if k not in ("messages", "audit", "original")}
                )[:width]
            )
            table.add_row(
                str(e.seq),
                e.type,
                _role(data),
                str(e.tokens),
                e.created_at.isoformat(timespec="seconds"),
                escape(detail),
                e.hash if full else e.hash[:12],
            )
        console.print(table)


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
            console.print(view_table(title, messages))


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
    table = Table(title=f"checkpoints of {session_id}", title_justify="left")
    for col in ("seq", "label", "at"):
        table.add_column(col)
    for c in found:
        table.add_row(
            str(c.seq), escape(c.label or "-"), c.created_at.isoformat(timespec="seconds")
        )
    console.print(table)


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
        console.print(view_table("view now", await session.view()))


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
        list_fn: Callable[[], Awaitable[list[dict[str, Any]]]] | None = getattr(
            ledger.store, "purges", None
        )
        if list_fn is None:
            raise click.UsageError("purge records live in PostgreSQL; this store has none")
        records = await list_fn()
    if as_json:
        _echo_json(records)
        return
    table = Table(title="purged sessions", title_justify="left")
    for col in ("session", "purged at", "by", "events", "reason", "last hash"):
        table.add_column(col, overflow="fold" if full else "ellipsis")
    for r in records:
        table.add_row(
            escape(r["session_id"]),
            r["purged_at"].isoformat(timespec="seconds"),
            escape(r["purged_by"]),
            str(r["events"]),
            escape(r["reason"]),
            (r["last_hash"] or "-") if full else (r["last_hash"] or "-")[:12],
        )
    console.print(table)


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
        purge_fn: Callable[[str, str], Awaitable[int]] | None = getattr(ledger.store, "purge", None)
        if purge_fn is None:
            raise click.UsageError("purge needs a PostgreSQL store")
        n = await purge_fn(session_id, reason)
        console.print(f"purged {session_id}: {n} events (audited)")


@main.group()
def keys() -> None:
    """API keys of the service: each belongs to a tenant; the first one ends local mode."""


async def _admin(ctx: click.Context) -> Any:
    """A connection as the administrator (the DSN's user), on a migrated database."""
    import asyncpg

    from contextledger.store.dsn import asyncpg_dsn

    async with _open(ctx, migrate=True) as ledger:
        if ledger.dsn is None or ledger.dsn == "memory://":
            raise click.UsageError("keys need a PostgreSQL store")
        return await asyncpg.connect(asyncpg_dsn(ledger.dsn))


@keys.command("create")
@click.argument("tenant")
@click.option("--name", default="", help="A note saying whose key this is.")
@click.pass_context
@_run
async def keys_create(ctx: click.Context, tenant: str, name: str) -> None:
    """Create a key for TENANT; it is printed once and stored only as a hash."""
    from contextledger.http.keys import create_key

    conn = await _admin(ctx)
    try:
        key_id, key = await create_key(conn, tenant, name)
    finally:
        await conn.close()
    err_console.print(f"created key {key_id} for tenant {tenant} (shown once):")
    click.echo(key)


@keys.command("list")
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
    table = Table(title="API keys", title_justify="left")
    for col in ("key id", "tenant", "name", "created", "revoked"):
        table.add_column(col)
    for k in found:
        revoked = k.revoked_at.strftime("%Y-%m-%d %H:%M") if k.revoked_at else ""
        table.add_row(
            k.key_id, k.tenant, escape(k.name), k.created_at.strftime("%Y-%m-%d %H:%M"), revoked
        )
    console.print(table)


@keys.command("revoke")
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


@main.command()
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
            f"the service needs the 'service' extra: pip install 'contextledger[service]' ({exc})"
        ) from None
    from contextledger.log_setup import configure_logging

    obj = ctx.obj
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
        err_console.print(f"[red]{exc}[/red]")
        sys.exit(2)


@main.command()
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
