"""Code that runs inside the engine venv (vLLM, AutoAWQ, llm-compressor), never inside the panel.

Each module is a script run as `ENGINE_PYTHON -m engine.<module>` from the project root, through the panel's one
process helper (panel/jobs/processes.py). It talks back in JSON lines on stdout. Nothing here imports the panel or
Django: the engine venv has neither.
"""
