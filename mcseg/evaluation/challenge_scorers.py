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

from mcseg.evaluation.figure_declaration import Figure, shows
from mcseg.evaluation.scorers import CaseView, Scorer
from mcseg.metrics.challenge import (NDSC_R, curvas_class_dice, lesion_f1, ndsc_aac, normalised_dice, qubrats_curves,
                                     uncertainty_0_100)

__all__ = ["ShiftsLesionScorer", "QuBratsScorer", "CurvasRatersScorer", "LESION_F1_IOU"]

#: where a challenge's figures show (their components, QU-BraTS's three AUCs, in summary.json, per_case.csv and the
#: trackers only): a column of mcseg-report's table with its interval and paired test (``tested``, the default) and
#: a table under shift; mcseg-report leaves out a column that no evaluation scored (another kind of task)
REPORTED = shows("report", "shift")
#: the IoU threshold of a detected lesion (Shifts ``test.py``; ``lesion_f1_score``'s own default is 0.25)
LESION_F1_IOU = 0.5


class ShiftsLesionScorer(Scorer):
    """nDSC, nDSC R-AAC and lesion F1 of the foreground of a binary task (module docstring)."""

    figures = (
        Figure("ndsc", "nDSC", "class", "segmentation", +1, REPORTED, protocol=(
            "normalised Dice of the foreground (Raina et al. 2023; Shifts mswml/metrics.py dice_norm_metric, "
            f"r = {NDSC_R:g}): 2 TP / (2 TP + FN + k FP), k = (1 - r) |reference| / (r (|grid| - |reference|)); "
            "1 when both are empty")),
        Figure("ndsc_aac", "nDSC R-AAC", "class", "failure", -1, REPORTED, protocol=(
            "area above the nDSC retention curve (Shifts mswml/retention_curves.py): voxels retained in order of "
            "rising binary entropy of the foreground probability, the rejected ones replaced by the reference; every "
            "voxel of the grid; NaN without probabilities")),
        Figure("lesion_f1", f"lesion F1 (IoU {LESION_F1_IOU:g})", "class", "segmentation", +1, REPORTED, protocol=(
            f"lesion-scale F1 (Shifts mswml/metrics.py lesion_f1_score): connected lesions of the prediction and "
            f"the reference matched at IoU >= {LESION_F1_IOU:g} (the Shifts evaluation script's threshold); 1 when "
            "both have no lesion")),
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
        Figure("qubrats_score", "QU-BraTS score", "class", "failure", +1, REPORTED, protocol=(
            "QU-BraTS (Mehta et al. 2022; RagMeh11/QU-BraTS BraTS_Seg_Uncertainty.py) per region: "
            "(AUC_Dice + (1 - AUC_FTP) + (1 - AUC_FTN)) / 3 over the uncertainty thresholds 0..100 in steps of "
            "2.5; uncertainty 100 x the binary entropy of p_r in bits; every voxel of the grid the brain mask")),
        Figure("qubrats_dice_auc", "QU-BraTS Dice AUC", "class", "failure", +1,
               protocol="QU-BraTS: area under the Dice of the voxels retained below each uncertainty threshold"),
        Figure("qubrats_ftp_auc", "QU-BraTS FTP AUC", "class", "failure", -1,
               protocol="QU-BraTS: area under the ratio of filtered true positives over the uncertainty thresholds"),
        Figure("qubrats_ftn_auc", "QU-BraTS FTN AUC", "class", "failure", -1,
               protocol="QU-BraTS: area under the ratio of filtered true negatives over the uncertainty thresholds"),
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

    figures = (Figure("curvas_thresholded_dice", "CURVAS thresholded Dice", "class", "segmentation", +1, REPORTED,
                      protocol=("CURVAS-PDACVI thresholded Dice (curvas-challenge merged_dice_score) per foreground "
                                "class c: mean over t in linspace(0.1, 0.8, 6) of 2|A_t & G_t| / (|A_t| + |G_t| + "
                                "1e-6), A_t = p_c > t, G_t = the raters' mean of [y_r = c] > t; 1 at a t where both "
                                "are empty; NaN without raters' maps or probabilities")),)
    needs_raters = True

    @classmethod
    def applies(cls, num_classes: int, multilabel: bool) -> bool:
        return not multilabel

    def score(self, case: CaseView) -> dict:
        if case.raters is None or case.probs is None:
            return {"curvas_thresholded_dice": [math.nan] * self.num_classes}
        return {"curvas_thresholded_dice": curvas_class_dice(case.probs, case.raters, self.num_classes).tolist()}
