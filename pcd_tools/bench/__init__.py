"""`pcd bench`: the reference scenarios (`scenarios`) measured against the baselines (`run`)."""
