"""The reconcile loop's sub-reconcilers, one module per phase: :mod:`.plan`, :mod:`.provision`, :mod:`.run`,
:mod:`.interruptions`, :mod:`.finish`. Each holds functions of the :class:`~gpuscaler.controller.reconcile.Reconciler`
(their ``self``) that the class binds as its methods, so :meth:`Reconciler.step` dispatches as before."""
