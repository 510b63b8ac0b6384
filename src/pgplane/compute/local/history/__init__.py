"""Each branch's history: its archived WAL, base states, rebuilds at a point, the keeper."""
