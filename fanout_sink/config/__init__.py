"""The sink's configuration: the whole file (:class:`~fanout_sink.config.models.SinkConfig`), one
module per section (``source``, ``topics``, ``tables``, ``maintenance``, ``runtime``) over shared
value types (``fields``), reading a YAML file into them with readable errors
(:mod:`~fanout_sink.config.loading`), and which keys name secrets (:mod:`~fanout_sink.config.secrets`)."""
