"""The tested arithmetic of the benchmarks under benchmarks/ (each script there parses its
arguments, runs, prints): `steps` (judge steps and their latency), `gpu` (markers, clocks, Nsight
Compute), `profile` (the profile tool over the bundled solutions)."""
