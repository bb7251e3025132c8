"""Concept and entity pages compiled across tasks (issue 17): `model` (the record and its
files), `evidence` (index rows → concepts, pure after one load), `compiler` (deterministic
pages and the model-written ones), `claims` (the citation and figure check), `freshness`,
`render` (a record as a journal page)."""
