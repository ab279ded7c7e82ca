"""gpuscaler.handlers: see DESIGN.md layers."""
