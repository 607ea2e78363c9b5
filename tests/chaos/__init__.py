"""The chaos runner: the real app against the real broker and catalog, broken on purpose, then counted.

``PYTHONPATH=tests python -m chaos --cycles N --records M --seed S`` starts a private broker and catalog,
keeps a producer writing records with unique ids, and runs the sink as an operator would (restarting
it when it dies). Each cycle breaks one thing at a seeded random moment (see ``kills``). At the end it
drains the sink and checks every table row by row (see ``verify``): exactly-once is a count, not a log
line.
"""
