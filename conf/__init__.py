"""The embedded default config; installed as ``kernel.conf`` so it ships in the wheel."""
