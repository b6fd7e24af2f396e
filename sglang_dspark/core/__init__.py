"""Pure DSpark algorithms: lossless verification, verify-length scheduling, SPS tables and
confidence calibration. Torch only, any device, no imports from the rest of the package."""
