"""The framework adapters: Google ADK, LangGraph, openai-agents and pydantic-ai."""
