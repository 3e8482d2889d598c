"""finetuning"""
