"""Serving EaE: entity linking, question answering and new entities over HTTP (Ray Serve).

engine.py (no Ray) does the work; app.py is the Serve application (a FastAPI ingress and a
model deployment with dynamic batching); index.py / table.py retrieve through faiss; pyfunc.py
is the registered MLflow model's code, whose predict is the engine's linking.
"""
