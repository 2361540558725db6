"""Exports of a trained field: a coloured triangle mesh by marching cubes (``mesh``) and a coloured point cloud at
the training views' expected ray termination (``pointcloud``); files written through trimesh. ``silhouette`` and
``picture`` look at such files from a scene's cameras (a mask; a PNG)."""
