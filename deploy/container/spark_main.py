"""The application file for spark-submit and the Spark operator (`local:///opt/walbridge/spark_main.py`).

spark-submit runs a Python file, not a console script; this one hands its arguments
(`run ...` or `verify ...`) to the consumer's command line.
"""

import sys

from spark_consumer.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
