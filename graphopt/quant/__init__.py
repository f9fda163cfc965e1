"""INT8 post-training quantization: calibration data, activation statistics, QuantizeInt8."""

from graphopt.quant.calib_data import read_calibration
from graphopt.quant.calibrate import calibrate
from graphopt.quant.int8 import QuantizeInt8
from graphopt.quant.stats import METHODS, TensorStats

__all__ = ["METHODS", "QuantizeInt8", "TensorStats", "calibrate", "read_calibration"]
