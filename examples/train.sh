#!/bin/sh
# A stand-in for a training script: what a job's member sees, a few lines of output, exit 0.
echo "train.sh: rank ${RANK:-0} of ${WORLD_SIZE:-1} on $(hostname)"
echo "train.sh: cards CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-none}, LR=${LR:-unset}"
for step in 1 2 3; do
  echo "train.sh: step $step/3 loss=0.$((9 - step))"
  sleep 1
done
echo "train.sh: done"
