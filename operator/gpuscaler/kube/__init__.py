"""Kubernetes access of the operator: worker pods, the rendezvous Service, and their observed state.

:mod:`gpuscaler.kube.workers` builds the manifests (pure functions) and reads pod state from watch
bodies; :mod:`gpuscaler.kube.client` creates and deletes them (create-if-absent, delete-if-present).
"""
