"""gpuscaler.kube: see DESIGN.md layers."""
