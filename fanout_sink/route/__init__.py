"""``fanout-sink route``: where each record would land, run through the workers' own processor with
nothing written (records from a sample file, :mod:`.samples`, or a topic's tail, :mod:`.last_records`;
:mod:`.preview` runs them, :mod:`.report` prints the outcome)."""
