"""The native range reader's C extension (fanout_sink/kafka/librdkafka_arrow.c), optional: without
a C compiler or Python's headers the install still succeeds and the readers use confluent-kafka's
consume (fanout_sink/kafka/native_consume.py logs which). Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fanout_sink.kafka.librdkafka_arrow",
            sources=["fanout_sink/kafka/librdkafka_arrow.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
