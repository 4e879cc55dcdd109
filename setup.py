"""The one compiled part of walbridge: schemas._wire_native (schemas/native_encoder.py says
what it does). Optional: where it cannot be built (no C compiler, e.g. a slim container base)
the install goes on and the producer uses the generated Python encoder, which gives the same
bytes. Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "schemas._wire_native",
            sources=["schemas/_wire_native.c"],
            optional=True,
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
