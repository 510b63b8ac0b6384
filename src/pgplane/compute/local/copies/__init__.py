"""Building a branch's data: a new timeline from the template, a copy of a parent, spare files."""
