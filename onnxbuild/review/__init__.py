"""Review and analysis: what a recipe change does (diff, modeldiff), where a variant first goes
wrong (divergence), what a dependency bump does (upgrade), and a rebuild from scratch (verify)."""
