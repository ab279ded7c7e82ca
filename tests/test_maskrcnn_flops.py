"""The catalog's Mask R-CNN training FLOPs are what ``scripts/maskrcnn_flops.py`` derives from the layer
shapes, and those shapes reproduce the published inference count."""

from __future__ import annotations

from types import ModuleType

import repo_scripts
from gpuscaler.catalog import load_catalog


def _script() -> ModuleType:
    return repo_scripts.load("scripts/maskrcnn_flops.py", "maskrcnn_flops")


def test_the_catalog_figure_is_the_derived_training_flops() -> None:
    m = _script()
    train = m.mask_rcnn(m.TRAIN_SIZE, m.TRAIN_BOX_ROIS, m.TRAIN_MASK_ROIS, training=True)
    derived = 2 * train.training_macs
    assert abs(load_catalog().workload("maskrcnn").flops_per_sample / derived - 1) < 0.01


def test_the_layer_shapes_reproduce_the_published_inference_count() -> None:
    """MMDetection's model zoo gives about 260 GMACs at 1333x800 for Mask R-CNN R50-FPN."""
    m = _script()
    infer = m.mask_rcnn(m.INFER_SIZE, m.INFER_BOX_ROIS, m.INFER_MASK_ROIS, training=False)
    assert 250e9 < infer.forward < 280e9


def test_frozen_layers_and_fewer_rois_make_training_less_than_three_forwards() -> None:
    m = _script()
    train = m.mask_rcnn(m.TRAIN_SIZE, m.TRAIN_BOX_ROIS, m.TRAIN_MASK_ROIS, training=True)
    assert train.frozen > 0 and train.weight_grad_only > 0
    assert train.forward < train.training_macs < 3 * train.forward
    # Fewer sampled boxes, fewer MACs in the box head: the count follows the configuration.
    fewer = m.mask_rcnn(m.TRAIN_SIZE, m.TRAIN_BOX_ROIS // 2, m.TRAIN_MASK_ROIS, training=True)
    assert fewer.parts["box head"] * 2 == train.parts["box head"]
