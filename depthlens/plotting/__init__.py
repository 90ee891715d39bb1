"""Plotting primitives below the diagnostics: heatmaps, share curves, terminal views and atomic figure files
(`plots`), and what every figure shares (`panels`). Matplotlib and seaborn are imported inside the functions."""
