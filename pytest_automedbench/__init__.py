"""AutoMedBench: a pytest plugin that grades LLM coding agents on medical-AI research."""
