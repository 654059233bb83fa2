"""`tgi-llm-launcher`: TGI's launcher flags, weights preparation, and tritonserver with our model."""
