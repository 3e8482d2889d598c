"""The config schema: every section's defaults, the allowed values, encoder sizes, curricula."""
