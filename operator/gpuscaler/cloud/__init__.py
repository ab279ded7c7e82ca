"""gpuscaler.cloud: see DESIGN.md layers."""
