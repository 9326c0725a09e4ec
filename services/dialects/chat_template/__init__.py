"""Chat-template models (Qwen3, DeepSeek, Llama 3, Mistral, Hermes-style): a Jinja
template for the prompt, reasoning and tool-call parsers for the output; the second
dialect. Built from the model's files (``ChatTemplateFiles``), which its workers publish
on the bus, so that the API and the parser need no model directory."""
