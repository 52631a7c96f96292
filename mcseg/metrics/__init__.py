"""Metrics of segmentation quality and calibration; see docs/protocol.md for the definitions.

Each metric is a MONAI-style class (call per case, ``aggregate()``, ``reset()``) with a
functional twin; calibration is accumulated as per-bin sums on the probabilities' device.
"""

from mcseg.metrics.adaptive import adaptive_ece, adaptive_ece_from_histogram
from mcseg.metrics.binning import BinSums, bin_index, bin_sums
from mcseg.metrics.calibration import (
    CalibrationMetric,
    CalibrationStats,
    CaseCalibration,
    case_calibration,
    class_sums,
    top_label,
)
from mcseg.metrics.empty import StructureStatus, status_counts, structure_status, worst_case_distance
from mcseg.metrics.overlap import DiceMetric, OverlapCounts, dice, dice_score, overlap_counts
from mcseg.metrics.rater_calibration import (
    SoftCalibration,
    curvas2024_crop,
    curvas2025_crop,
    curvas_ece,
    soft_calibration,
)
from mcseg.metrics.raters import (
    CURVAS2025_THRESHOLDS,
    QUBIQ_THRESHOLDS,
    consensus_dice,
    curvas_row_dice,
    per_rater_dice,
    per_rater_hd,
    rater_mean,
    thresholded_dice,
)
from mcseg.metrics.regions import REGIONS, boundary_band, region_mask
from mcseg.metrics.samples import generalised_energy_distance, hungarian_matched_iou, linear_assignment
from mcseg.metrics.volume import crps_curvas_code, crps_normal, volume_crps
from mcseg.metrics.reliability import reliability_figure, reliability_table
from mcseg.metrics.statistics import bootstrap_ci, describe
from mcseg.metrics.surface import (
    HD_DEFINITIONS,
    SurfaceDistanceMetric,
    SurfaceDistances,
    boundary_mask,
    directed_distances,
    surface_distances,
    surface_points,
)

__all__ = [
    "BinSums", "bin_index", "bin_sums",
    "CalibrationMetric", "CalibrationStats", "CaseCalibration", "case_calibration", "class_sums", "top_label",
    "adaptive_ece", "adaptive_ece_from_histogram",
    "StructureStatus", "status_counts", "structure_status", "worst_case_distance",
    "DiceMetric", "OverlapCounts", "dice", "dice_score", "overlap_counts",
    "REGIONS", "boundary_band", "region_mask",
    "SoftCalibration", "curvas2024_crop", "curvas2025_crop", "curvas_ece", "soft_calibration",
    "CURVAS2025_THRESHOLDS", "QUBIQ_THRESHOLDS", "consensus_dice", "curvas_row_dice", "per_rater_dice",
    "per_rater_hd", "rater_mean", "thresholded_dice",
    "generalised_energy_distance", "hungarian_matched_iou", "linear_assignment",
    "crps_curvas_code", "crps_normal", "volume_crps",
    "reliability_figure", "reliability_table",
    "bootstrap_ci", "describe",
    "HD_DEFINITIONS", "SurfaceDistanceMetric", "SurfaceDistances", "boundary_mask", "directed_distances",
    "surface_distances", "surface_points",
]
