"""Serving: the async engine both front ends share, the OpenAI HTTP API, gRPC (TGIS), metrics."""
