"""Calibration losses for segmentation: every loss is an ``nn.Module`` called as ``loss(logits, target)``.

Softmax losses (``multilabel = False``): logits ``B x C x spatial``, integer labels
``B x spatial``. Multi-label losses (``multilabel = True``: ``SigmoidBCELoss``, ``SPALoss``):
logits and 0/1 targets ``B x R x spatial``. ``loss.probabilities(logits)`` gives the
probabilities to evaluate. See ``docs/losses.md`` for formulas, defaults and papers.
"""

from .ace import L1ACELoss
from .base import SegmentationLoss
from .brier import BrierLoss
from .crac import CRaCLoss
from .cross_entropy import CELoss, ECPLoss, LabelSmoothingLoss
from .dca import DCALoss, MDCALoss
from .dice import CEDiceLoss, DiceSemimetricLoss, SoftDice
from .focal import AdaFocalLoss, DualFocalLoss, FCLLoss, FLSDLoss, FocalLoss
from .margin import ACLSLoss, CALSLoss, MarginDiceLoss, MarginLoss
from .multilabel import MultiLabelLoss, SigmoidBCELoss, SPALoss
from .nacl import NACLLoss
from .sdc import SDCLoss
from .svls import SVLSLoss

__all__ = [
    "ACLSLoss",
    "AdaFocalLoss",
    "BrierLoss",
    "CALSLoss",
    "CEDiceLoss",
    "CELoss",
    "CRaCLoss",
    "DCALoss",
    "DiceSemimetricLoss",
    "DualFocalLoss",
    "ECPLoss",
    "FCLLoss",
    "FLSDLoss",
    "FocalLoss",
    "L1ACELoss",
    "LabelSmoothingLoss",
    "MDCALoss",
    "MarginDiceLoss",
    "MarginLoss",
    "MultiLabelLoss",
    "NACLLoss",
    "SDCLoss",
    "SPALoss",
    "SVLSLoss",
    "SegmentationLoss",
    "SigmoidBCELoss",
    "SoftDice",
]
