"""Per-case scorers of the field's challenge figures (:mod:`mcseg.metrics.challenge`; docs/protocol.md,
"Challenge metrics"), each active only on the tasks its challenge scores (:meth:`Scorer.applies`):

* :class:`ShiftsLesionScorer`, binary softmax tasks (two classes, one foreground: the Shifts MS lesion task):
  nDSC, the area above the nDSC retention curve (R-AAC) and lesion F1 (IoU threshold 0.5, the Shifts
  evaluation script's) of the foreground. The prediction is the evaluator's (argmax), not the Shifts baseline's
  (ensemble mean >= 0.35, lesions of at most 9 voxels removed); the uncertainty ordering the retention curve is
  the binary entropy of the foreground probability (the Shifts script orders by the ensemble's reverse mutual
  information; the formula takes any map); every voxel of the case's grid is scored (the Shifts script: the
  brain mask for the R-AAC, the whole volume for nDSC and F1).
* :class:`QuBratsScorer`, region (multilabel) tasks such as ``dataset=brats_regions`` (WT, TC, ET): per region
  the QU-BraTS AUCs of the Dice of the retained voxels, of the filtered true positives and true negatives over
  the 41 uncertainty thresholds, and the combined score. The region masks are the task's own (prediction
  p_r > 0.5 per region, the label's region r; QU-BraTS derives WT/TC/ET from one label map, nested by
  construction); the uncertainty is 100 x the binary entropy of p_r in bits (QU-BraTS takes the participant's
  map); the brain mask is every voxel of the case's grid (QU-BraTS: T1 > 0).
* :class:`CurvasRatersScorer`, softmax tasks whose cases have several raters (``needs_raters``: an evaluator
  built with ``raters=True``): CURVAS-PDACVI's thresholded Dice of each foreground class c, the probability
  p_c and the raters' mean of [y_r = c] thresholded at linspace(0.1, 0.8, 6) (the challenge's code; its task
  is binary, PDAC). A case without raters' maps, or without probabilities, scores NaN.

Without probabilities (a label map alone) the uncertainty-based figures are NaN; nDSC and F1 are still scored.
"""
from __future__ import annotations

import math

from mcseg.evaluation.figure_declaration import Figure
from mcseg.evaluation.scorers import CaseView, Scorer
from mcseg.metrics.challenge import (curvas_class_dice, lesion_f1, ndsc_aac, normalised_dice, qubrats_curves,
                                     uncertainty_0_100)

__all__ = ["ShiftsLesionScorer", "QuBratsScorer", "CurvasRatersScorer", "LESION_F1_IOU"]

#: the IoU threshold of a detected lesion (Shifts ``test.py``; ``lesion_f1_score``'s own default is 0.25)
LESION_F1_IOU = 0.5


class ShiftsLesionScorer(Scorer):
    """nDSC, nDSC R-AAC and lesion F1 of the foreground of a binary task (module docstring)."""

    figures = (
        Figure("ndsc", "nDSC", "class", "segmentation", +1),
        Figure("ndsc_aac", "nDSC R-AAC", "class", "failure", -1),
        Figure("lesion_f1", f"lesion F1 (IoU {LESION_F1_IOU:g})", "class", "segmentation", +1),
    )

    @classmethod
    def applies(cls, num_classes: int, multilabel: bool) -> bool:
        return num_classes == 2 and not multilabel

    def score(self, case: CaseView) -> dict:
        pred, ref = (case.prediction == 1).cpu(), (case.label == 1).cpu()
        aac = math.nan
        if case.probs is not None:
            aac = ndsc_aac(pred, ref, uncertainty_0_100(case.probs[1].cpu()))
        return {"ndsc": [math.nan, normalised_dice(pred, ref)], "ndsc_aac": [math.nan, aac],
                "lesion_f1": [math.nan, lesion_f1(pred, ref, LESION_F1_IOU)]}


class QuBratsScorer(Scorer):
    """The QU-BraTS AUCs and score per region of a multilabel task (module docstring)."""

    figures = (
        Figure("qubrats_score", "QU-BraTS score", "class", "failure", +1),
        Figure("qubrats_dice_auc", "QU-BraTS Dice AUC", "class", "failure", +1),
        Figure("qubrats_ftp_auc", "QU-BraTS FTP AUC", "class", "failure", -1),
        Figure("qubrats_ftn_auc", "QU-BraTS FTN AUC", "class", "failure", -1),
    )

    @classmethod
    def applies(cls, num_classes: int, multilabel: bool) -> bool:
        return multilabel

    def score(self, case: CaseView) -> dict:
        keys = [f.key for f in self.figures]
        if case.probs is None:
            return {key: [math.nan] * self.num_classes for key in keys}
        values = {key: [] for key in keys}
        for r in range(self.num_classes):
            curves = qubrats_curves(case.prediction[r].cpu() > 0, case.label[r].cpu() > 0,
                                    uncertainty_0_100(case.probs[r].cpu()))
            for key, value in zip(keys, (curves.score, curves.dice_auc, curves.ftp_auc, curves.ftn_auc)):
                values[key].append(value)
        return values


class CurvasRatersScorer(Scorer):
    """CURVAS-PDACVI's thresholded Dice per foreground class against several raters (module docstring)."""

    figures = (Figure("curvas_thresholded_dice", "CURVAS thresholded Dice", "class", "segmentation", +1),)
    needs_raters = True

    @classmethod
    def applies(cls, num_classes: int, multilabel: bool) -> bool:
        return not multilabel

    def score(self, case: CaseView) -> dict:
        if case.raters is None or case.probs is None:
            return {"curvas_thresholded_dice": [math.nan] * self.num_classes}
        return {"curvas_thresholded_dice": curvas_class_dice(case.probs, case.raters, self.num_classes).tolist()}
