"""The head revision the code needs, read from the migration scripts without alembic."""

from __future__ import annotations

from pathlib import Path

from alembic.script import ScriptDirectory

from contextledger.store import migrate


def _script(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(f'"""{name}"""\n\nfrom alembic import op\n\n{body}\n')


def test_the_chain_head_is_alembic_s_head() -> None:
    alembic_head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert migrate.chain_head(migrate.migrations_dir() / "versions") == alembic_head
    assert migrate.head_revision() == alembic_head


def test_a_chain_out_of_file_order_has_its_last_link_as_head(tmp_path: Path) -> None:
    _script(tmp_path, "a", 'revision = "a"\ndown_revision = None')
    _script(tmp_path, "b", 'revision: str = "b"\ndown_revision: str | None = "c"')
    _script(tmp_path, "c", 'revision = "c"\ndown_revision = "a"\nbranch_labels = None')
    assert migrate.chain_head(tmp_path) == "b"


def test_what_is_not_one_plain_chain_is_left_to_alembic(tmp_path: Path) -> None:
    _script(tmp_path, "a", 'revision = "a"\ndown_revision = None')
    _script(tmp_path, "b", 'revision = "b"\ndown_revision = "a"')
    _script(tmp_path, "c", 'revision = "c"\ndown_revision = "a"')
    assert migrate.chain_head(tmp_path) is None  # two heads
    _script(tmp_path, "m", 'revision = "m"\ndown_revision = ("b", "c")')
    assert migrate.chain_head(tmp_path) == "m"  # merged again
    _script(tmp_path, "n", 'revision = "n"\ndown_revision = "m"\ndepends_on = "x"')
    assert migrate.chain_head(tmp_path) is None  # a dependency
    _script(tmp_path, "n", 'revision = "n"\ndown_revision = "zz"')
    assert migrate.chain_head(tmp_path) is None  # a link to no script
    _script(tmp_path, "n", 'revision = "n"\ndown_revision = compute()')
    assert migrate.chain_head(tmp_path) is None  # not a literal
