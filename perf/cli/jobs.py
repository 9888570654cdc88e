"""Prints a YAML stream of small GPU Jobs (about 830 bytes each) of at least N megabytes."""
import sys

JOB = """apiVersion: batch/v1
kind: Job
metadata:
  name: job-{i}
  namespace: team-{ns}
  labels:
    app: train
    team: team-{ns}
    experiment: exp-{i}
  annotations:
    owner: someone@example.com
    description: a small training job generated for the CLI benchmark
spec:
  backoffLimit: 4
  template:
    metadata:
      labels:
        app: train
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: registry.example/train:1.{i}
        command: ["python", "train.py", "--epochs", "10", "--batch-size", "64"]
        env:
        - name: DATASET
          value: s3://bucket/datasets/imagenet
        - name: CHECKPOINT_DIR
          value: /checkpoints/job-{i}
        resources:
          limits:
            nvidia.com/gpu: {gpus}
            cpu: "4"
            memory: 16Gi
"""

limit = int(sys.argv[1]) * 1024 * 1024
size = 0
i = 0
out = sys.stdout
while size < limit:
    text = ("---\n" if i else "") + JOB.format(i=i, ns=i % 20, gpus=1 + i % 4)
    out.write(text)
    size += len(text)
    i += 1
