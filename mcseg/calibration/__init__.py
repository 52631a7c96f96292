"""Post-hoc calibration: temperature, vector and local temperature scaling fitted on the validation split."""
from mcseg.calibration.posthoc import CALIBRATION_FILE, PosthocConfig, fit_posthoc, load_calibration, scalers_to_apply
from mcseg.calibration.scaler_registry import SCALER_TYPES, Scaler
from mcseg.calibration.logit_scaling import SCALERS, fit_scaler, nll, scale_logits

__all__ = ["CALIBRATION_FILE", "PosthocConfig", "SCALERS", "SCALER_TYPES", "Scaler", "fit_posthoc", "fit_scaler",
           "load_calibration", "nll", "scale_logits", "scalers_to_apply"]
