"""Pure DSpark algorithms: lossless verification, verify-length scheduling, SPS tables and
confidence calibration; plus the CPU weight layout that both model runners (drafter, target)
share. Torch only, any device, no imports from the rest of the package."""
