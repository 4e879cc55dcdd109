"""walbridge spark_consumer."""
