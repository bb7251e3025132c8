"""ledger/stored_forms.py is the models' stored forms (`codec.stored_forms`), not a second
definition: a model changed without regenerating the table fails here, with the command that
regenerates it."""

from __future__ import annotations

from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.stored_forms import FORMS

REGENERATE = (
    ".venv/bin/python -c \"import pprint; from infer_forge.ledger import codec; "
    "pprint.pprint(codec.stored_forms(), width=96, compact=True)\"  # paste as FORMS")


def _ours(table: dict) -> dict:
    """The package's own event types (some tests define more: test_index, test_ledger_store)."""
    return {t: x for t, x in table.items()
            if E.EVENT_TYPES[t].__module__.startswith("infer_forge.")}


def test_the_table_is_generated_from_the_models():
    assert FORMS == codec.stored_forms(), REGENERATE


def test_every_event_type_and_its_version_is_in_the_table():
    assert set(FORMS) == set(_ours(E.EVENT_TYPES))
    assert {t: v for t, (v, _f) in FORMS.items()} == {
        t: c.SCHEMA_VERSION for t, c in _ours(E.EVENT_TYPES).items()}
    # The forms the table can express cover every type today (None: always decoded).
    assert [t for t, (_v, f) in FORMS.items() if f is None] == []
