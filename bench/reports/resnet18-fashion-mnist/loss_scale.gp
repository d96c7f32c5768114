# written by mixprec; re-plot with: cd 'bench/reports/resnet18-fashion-mnist' && gnuplot 'loss_scale.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'loss_scale.png'
set title 'loss scale'
set xlabel 'step'
set ylabel 'scale'
set grid
set datafile missing '?'
set logscale y
set key top right
plot 'loss_scale.dat' index 0 using 1:2 with lines lw 2 title 'fp32', \
     'loss_scale.dat' index 1 using 1:2 with lines lw 2 title 'bf16'
