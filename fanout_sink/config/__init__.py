"""The sink's configuration: its models (:mod:`~fanout_sink.config.models`), reading a YAML file
into them with readable errors (:mod:`~fanout_sink.config.loading`), and which keys name secrets
(:mod:`~fanout_sink.config.secrets`)."""
