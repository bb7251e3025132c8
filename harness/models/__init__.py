"""Model weights: pulling a hub model or generating one from a recipe into
`FORGE_HOME/models/` (`weights`)."""
