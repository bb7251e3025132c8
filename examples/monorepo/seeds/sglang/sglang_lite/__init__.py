"""A stand-in package: the local MonoRepo's engine member."""

VERSION = "0.0.1"
