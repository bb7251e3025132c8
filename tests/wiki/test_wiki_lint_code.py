"""`forge wiki lint` reads links as markdown does (issue 27, item 12): `[[url|x]]` inside an
inline code span or a fenced block (``` or ~~~) is code, not a link, so it is neither broken
nor counted; a link beside the code still is."""

from __future__ import annotations

from infer_forge.wiki.lint import forward_links, lint_dir, without_code_spans

FRONT = "---\ntype: note\n---\n"


def test_links_inside_code_are_code(tmp_path):
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "index.md").write_text(FRONT + "# Index\n\n- [[notes|Notes]]\n")
    (wiki / "notes.md").write_text(FRONT + "\n".join([
        "# Notes",
        "The flag was set to `[[https://evil.example/x|click]]` by the agent.",
        "Double ticks: ``a ` [[javascript:alert(1)|x]] `` and back to [[index|home]].",
        "~~~",
        "[[tasks/nowhere|fenced]]",
        "~~~",
        "An escaped tick is text: \\`[[missing|m]]`",
    ]) + "\n")
    rep = lint_dir(wiki)
    assert rep.broken == [{"page": "notes", "target": "missing"}], rep.broken
    assert rep.links == 3 and not rep.orphans  # notes -> index, index -> notes, missing
    md = (wiki / "notes.md").read_text()
    assert forward_links(md) == ["index", "missing"]
    # Without the code, the page is clean.
    (wiki / "notes.md").write_text(md.replace("\\`[[missing|m]]`", "done"))
    assert lint_dir(wiki).ok


def test_an_unclosed_backtick_is_literal():
    assert without_code_spans("`open [[a|b]]") == "`open [[a|b]]"
    assert without_code_spans("x `` y ` [[a]]") == "x `` y ` [[a]]"
