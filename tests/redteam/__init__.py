"""The red team: escape and tampering attempts executed for real inside every sandbox backend."""
