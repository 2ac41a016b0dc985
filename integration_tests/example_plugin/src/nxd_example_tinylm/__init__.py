"""Example third-party nxd model plugin."""
