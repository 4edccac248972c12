"""Recording gateway: proxied OpenAI-compatible / SGLang traffic becomes the same TITO events the SDK writes."""
