"""What a sharded model needs: which slice of each weight a rank holds (``sharding.py``) and the
collectives its layers call (``group.py``). Spawning and driving the ranks is ``minisgl.parallel``."""
