"""The local stack: JVM jars from Maven Central and a real single-node Kafka broker."""
